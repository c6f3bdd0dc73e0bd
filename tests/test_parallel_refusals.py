"""`profile` refuses a parallel split in one line naming a fix that command takes."""


def test_a_denoiser_without_a_context_parallel_plan_is_refused_with_a_fix_profile_takes(cli):
    """`profile sdxl --gpu h100 --ulysses-degree 2` said "use --data-parallel", which profile does not take."""
    for where in (("--gpu", "a100"), ()):
        code, _, err = cli("profile", "tiny-sd", *where, "--ulysses-degree", "2")
        assert code == 2 and "has no context-parallel plan" in err and "use --data-parallel" not in err
        assert "drop --ulysses-degree/--ring-degree (--cfg-degree 2 splits its CFG batch instead)" in err
    code, _, err = cli("profile", "tiny-sd", "--gpu", "a100", "--cfg-degree", "2")
    assert code == 0, err

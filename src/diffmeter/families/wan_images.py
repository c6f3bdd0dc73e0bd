"""Wan's image-to-video checkpoints (WanImageToVideoPipeline): which take an image, which read it with CLIP, and
the first-and-last-frame ones (FLF2V), which take two."""

from diffmeter.errors import DiffmeterError


def image_to_video(entry) -> bool:
    """A Wan 2.1 I2V checkpoint: its own pipeline is WanImageToVideoPipeline, which needs an image."""
    return entry.pipeline_class == "WanImageToVideoPipeline"


def first_last(entry, spec) -> tuple[int, int] | None:
    """FLF2V (WanImageToVideoPipeline with ``last_image``): its transformer's image embedder joins the two images'
    CLIP tokens (``pos_embed_seq_len``), so it takes exactly the first and the last frame. Without CLIP (Wan 2.2 I2V
    A14B) a last frame only changes the video the VAE encodes (pipeline_wan_i2v.py:435-440, diffusers 0.42.1), so one
    image or two; a Wan 2.1 I2V transformer without the joint embedding fails on two. None for one image."""
    joined = entry.components.get("transformer") and entry.components["transformer"].config.get("pos_embed_seq_len")
    if image_to_video(entry) and joined and len(spec.image_sizes) != 2:
        raise DiffmeterError(
            f"{entry.name} is a first-and-last-frame checkpoint (its transformer joins two images' CLIP tokens): pass "
            "--image-size twice, the first frame's then the last's"
        )
    if image_to_video(entry) and not reads_image(entry) and len(spec.image_sizes) > 2:
        raise DiffmeterError(
            f"{entry.name} animates a first frame and, if given, a last one: pass --image-size once or twice"
        )
    if len(spec.image_sizes) == 2 and image_to_video(entry) and (joined or not reads_image(entry)):
        return spec.image_sizes[0]
    return None


def reads_image(entry) -> bool:
    """Whether WanImageToVideoPipeline runs its CLIP image encoder: only for a transformer with an ``image_dim``
    (pipeline_wan_i2v.py 697-705, diffusers 0.42.1: Wan 2.1 I2V, not Wan 2.2 I2V A14B)."""
    return entry.components["transformer"].config.get("image_dim") is not None


def image_tokens(entry) -> int:
    """The CLIP vision encoder's tokens: one per patch of the crop, and the class token."""
    vision = entry.components["image_encoder"].config
    return (vision["image_size"] // vision["patch_size"]) ** 2 + 1

"""The operator-level counter: formulas, attention, attribution, block reuse."""

import pytest
import torch
import torch.nn.functional as F

from diffmeter.flops.counter import attention_flops, count_flops


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_linear_conv_and_attention_by_kind(device):
    with torch.device(device):
        linear, conv = torch.nn.Linear(32, 16), torch.nn.Conv2d(4, 8, 3, padding=1)
        x, image = torch.zeros(2, 10, 32), torch.zeros(1, 4, 6, 6)
        q, k, v = torch.zeros(2, 4, 10, 8), torch.zeros(2, 4, 12, 8), torch.zeros(2, 4, 12, 16)
    with torch.no_grad(), count_flops() as counts:
        linear(x)
        conv(image)
        F.scaled_dot_product_attention(q, k, v)
    assert counts.by_kind() == {
        "matmul": 2 * (2 * 10) * 32 * 16,
        "convolution": 2 * (6 * 6) * 8 * (4 * 3 * 3),
        "attention": 2 * 2 * 4 * 10 * 12 * 8 + 2 * 2 * 4 * 10 * 12 * 16,
    }


def test_attention_counted_once_on_cpu_where_torch_registry_counts_zero():
    from torch.utils.flop_counter import FlopCounterMode

    q = torch.randn(1, 2, 16, 8)
    with FlopCounterMode(display=False) as torch_counter:
        F.scaled_dot_product_attention(q, q, q)
    with count_flops() as counts:
        F.scaled_dot_product_attention(q, q, q)
    assert torch_counter.get_total_flops() == 0  # the CPU flash kernel is not in torch's registry
    assert counts.total == attention_flops(q, q, q) == 2 * 2 * 2 * 16 * 16 * 8


def test_grouped_query_attention_counts_query_heads():
    q, kv = torch.zeros(1, 8, 5, 4, device="meta"), torch.zeros(1, 2, 5, 4, device="meta")
    with count_flops() as counts:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    assert counts.by_kind()["attention"] == 2 * 2 * 8 * 5 * 5 * 4


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_nested_attention_inside_multi_head_attention_is_counted(device):
    with torch.device(device):
        attention = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
        x = torch.zeros(2, 7, 16)
    with torch.no_grad(), count_flops() as counts:
        torch.nn.functional.multi_head_attention_forward(
            x.transpose(0, 1),
            x.transpose(0, 1),
            x.transpose(0, 1),
            16,
            4,
            attention.in_proj_weight,
            attention.in_proj_bias,
            None,
            None,
            False,
            0.0,
            attention.out_proj.weight,
            attention.out_proj.bias,
            training=False,
            need_weights=False,
        )
    projections = 2 * (2 * 7) * 16 * 16 * 4
    assert counts.total == projections + 2 * 2 * 2 * 4 * 7 * 7 * 4


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8)) for _ in range(4)
        )
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_module_attribution_and_depth():
    model, x = _Stack(), torch.zeros(5, 8)
    with torch.no_grad(), count_flops({"net": model}) as counts:
        model(x)
    per_linear = 2 * 5 * 8 * 8
    assert counts.by_module["net.blocks.2.0"]["matmul"] == per_linear
    assert counts.modules(1) == {"net.blocks": 8 * per_linear, "net.head": 2 * 5 * 8 * 3}
    assert counts.total == sum(counts.modules(1).values())
    # deeper, the head has no children: it is kept whole, so the rows still sum to the total (FLUX's proj_out and
    # embedders were dropped at --depth 2, 402.65 GMACs short)
    deeper = counts.modules(2)
    assert deeper["net.head"] == 2 * 5 * 8 * 3 and deeper["net.blocks.0"] == 2 * per_linear
    assert counts.total == sum(deeper.values())


class _OwnWork(torch.nn.Module):
    """A module doing a matmul in its own forward beside a child's."""

    def __init__(self):
        super().__init__()
        self.child = torch.nn.Linear(8, 8)
        self.weight = torch.nn.Parameter(torch.zeros(8, 4))

    def forward(self, x):
        return self.child(x) @ self.weight


def test_a_modules_own_work_beside_its_children_is_its_own_row():
    model, x = _OwnWork(), torch.zeros(5, 8)
    with torch.no_grad(), count_flops({"net": model}) as counts:
        model(x)
    assert counts.modules(1) == {"net.child": 2 * 5 * 8 * 8, "net (outside its submodules)": 2 * 5 * 8 * 4}
    assert counts.total == sum(counts.modules(1).values())


@pytest.mark.parametrize("submodules", [True, False])
def test_reusing_repeated_blocks_gives_identical_counts(submodules):
    with torch.device("meta"):
        model, x = _Stack(), torch.zeros(5, 8)
    with torch.no_grad(), count_flops({"net": model}) as plain:
        expected_output = model(x)
    with torch.no_grad(), count_flops({"net": model}, reuse_repeated_blocks=True, submodules=submodules) as reused:
        output = model(x)
    assert output.shape == expected_output.shape
    assert reused.total == plain.total
    if submodules:
        assert reused.modules(3) == plain.modules(3)
    assert model.blocks[0].forward.__func__ is torch.nn.Sequential.forward  # wrappers removed


class _Owner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = torch.nn.Linear(8, 8)
        self.own = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.own(self.shared(x))


class _Borrower(torch.nn.Module):
    """Runs another root's module as its own, as ZImageControlNetModel.from_transformer makes it do."""

    def __init__(self, shared: torch.nn.Module) -> None:
        super().__init__()
        self.shared = shared

    def forward(self, x):
        return self.shared(self.shared(x))


@pytest.mark.parametrize("order", ["owner first", "borrower first"])
def test_a_shared_module_counts_for_the_root_that_runs_it(order):
    owner = _Owner()
    borrower = _Borrower(owner.shared)
    roots = {"owner": owner, "borrower": borrower}
    if order == "borrower first":
        roots = dict(reversed(roots.items()))
    with torch.no_grad(), count_flops(roots) as counts:
        owner(torch.zeros(3, 8))
        borrower(torch.zeros(5, 8))
    linear = 2 * 8 * 8
    assert counts.by_module["owner"]["matmul"] == 3 * linear + 2 * 3 * 8 * 4
    assert counts.by_module["owner.shared"]["matmul"] == 3 * linear
    assert counts.by_module["borrower"]["matmul"] == counts.by_module["borrower.shared"]["matmul"] == 2 * 5 * linear
    assert counts.total == counts.by_module["owner"]["matmul"] + counts.by_module["borrower"]["matmul"]

"""benchmarks/profile_step.py's side-by-side breakdown (the profiling itself needs CUDA)."""
import pytest

from benchmarks import profile_step as ps


def test_every_router_kernel_is_found_and_categorised():
    names = ps._routing_kernel_names()
    from mhar.model.routing import _kernels
    assert "_route_fwd_table_kernel" in names and "_src_group_bwd_kernel" in names
    for n in names:
        assert hasattr(getattr(_kernels, n), "run")  # a Triton kernel (JITFunction / Autotuner)
        assert ps.kernel_category(n, names) == f"routing: {n}"
    # only names given as routing
    assert ps.kernel_category("_route_fwd_table_kernel") != "routing: _route_fwd_table_kernel"


@pytest.mark.parametrize("name,cat", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTN", "gemm"),
    ("flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "inductor fused"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("Memcpy DtoD (Device -> Device)", "copy / fill"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "aten elementwise / reduce"),
    ("some_unknown_kernel", "other"),
])
def test_kernel_categories(name, cat):
    assert ps.kernel_category(name, ("_route_fwd_table_kernel",)) == cat


def test_category_table_sums_and_differences():
    r = {"baseline": {"wall_ms": 10.0, "kernels": {"nvjet_gemm_a": [6.0, 3], "triton_poi_fused_add_0": [2.0, 4]}},
         "mhar": {"wall_ms": 11.5, "kernels": {"nvjet_gemm_a": [6.1, 3], "triton_per_fused_mul_1": [1.0, 2],
                                                "_route_fwd_table_kernel": [1.5, 49], "_score_kernel": [0.5, 49]}}}
    routing = ("_route_fwd_table_kernel", "_score_kernel")
    cats = ps.by_category(r["mhar"]["kernels"], routing)
    assert cats == pytest.approx({"gemm": 6.1, "inductor fused": 1.0, "routing: _route_fwd_table_kernel": 1.5,
                                  "routing: _score_kernel": 0.5})
    rows = {line.split("  ")[1].strip(): line.split() for line in ps.category_table(r, routing).splitlines()[1:]}
    assert float(rows["routing: _route_fwd_table_kernel"][-1]) == pytest.approx(1.5)  # d = mhar - baseline
    assert float(rows["inductor fused"][-1]) == pytest.approx(-1.0)
    assert float(rows["all kernels"][-3]) == pytest.approx(8.0) and float(rows["all kernels"][-1]) == pytest.approx(1.1)
    assert float(rows["wall"][-1]) == pytest.approx(1.5)
    first = ps.category_table(r, routing).splitlines()[1]
    assert first.strip().startswith("routing: _route_fwd_table_kernel")  # largest difference first


def test_launch_sites_groups_matching_launches_by_operator_shapes_and_stack():
    """``--stack``: the CPU operators whose launched kernels match, counted per iteration and grouped by (operator,
    shapes, stack); operators launching nothing that matches are left out."""
    from types import SimpleNamespace as NS

    fill = NS(name="vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>")
    add = NS(name="vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>")
    ev = [NS(name="aten::fill_", kernels=[fill], input_shapes=[[8, 2048, 1280], []],
             stack=["mhar/model/routing/fused.py(499): backward", "x.py(1): f"]) for _ in range(6)]
    ev += [NS(name="aten::zero_", kernels=[fill], input_shapes=[[64]], stack=["a.py(3): g"])]
    ev += [NS(name="aten::add", kernels=[add], input_shapes=[[4], [4]], stack=["b.py(2): h"]),
           NS(name="ProfilerStep", kernels=[], input_shapes=[], stack=[])]
    rows = ps.launch_sites(ev, r"FillFunctor<float>", iters=3, depth=1)
    assert rows == [(2.0, "aten::fill_", "[[8, 2048, 1280], []]", "mhar/model/routing/fused.py(499): backward"),
                    (1 / 3, "aten::zero_", "[[64]]", "a.py(3): g")]
    assert ps.launch_sites(ev, r"nothing") == []

export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
echo "=== tests $(date -u +%T)"
MHAR_ROUTING_AUTOTUNE=0 timeout -s INT -k 10 110 python3 -m pytest -v --tb=short -rfs -m gpu tests/test_fused_routing.py -k "v6_deep or v6_every or cuda_graph" 2>&1 | tee $OUT/tests_gpu.log | grep -E "FAILED|ERROR|passed|failed|Error" | tail -12
echo "=== op $(date -u +%T)"
timeout 230 python3 -W ignore -m benchmarks.bench_routing_op --graph 1 --impls fused fused_v5 --sizes 350M 1B 100M --out $OUT/routing_op.csv 2>&1 | tee $OUT/routing_op.log | grep -v Warn | tail -8
echo "=== end $(date -u +%T)"

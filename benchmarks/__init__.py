"""GPU benchmarks, one script per measured thing (records under results/bench/): bench_routing_op (the routing op),
bench_training (the training step), bench_inference (generation), memory_step (a step's peak memory),
traffic_bound (the byte model and its throughput bound), profile_step (the profiler), multigpu_check (DDP / FSDP2).
Their statistics go through eval/ (``analysis.throughput``); gpu_session.sh runs them in stages."""

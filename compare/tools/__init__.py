"""The research tools around the driver: each answers one question about one case, and none defines a kernel (the
kernels they need live in the kernel packages).

`one_case` is their shared command line (WORKLOAD, --case SET:INDEX, --impl, --variant), read by `kernel_times` (where a
call's GPU time goes), `one_call` (one call for an outside profiler), `hunt` (fresh inputs until the time runs out;
`hunt_ledger` adds hunts up across sessions), `call_cost` (what a call costs besides its kernels) and `hopper_compile`
(what a Triton port compiles to for sm_90, on any machine); `matmul_tilings` (which tilings keep the matmul's bits) and
`mosaic_gpu_probe` (what Mosaic GPU can express of eigh's stages) stand alone, and so do `gpu_mode_eval` (GPU MODE's own
eval.py on a port, from a checkout of its problems) and `gpu_mode_clock` (its clock from the port's own framework)."""

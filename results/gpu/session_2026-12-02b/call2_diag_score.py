"""Score kernel at 1B shapes with a given (BLOCK_T, warps): compare with torch; run under CUDA_LAUNCH_BLOCKING=1."""
import sys, torch, triton
from mhar.routing import _kernels as K_
bt, nw, D, K, klo = (int(a) for a in sys.argv[1:6])
H, BT, eps = 8, 2048, 1e-6
torch.manual_seed(0)
buf = torch.randn(2, BT, D, device="cuda").bfloat16()
ss = buf.float().pow(2).sum(-1).contiguous()
W = torch.randn(K, D, device="cuda")
S = torch.zeros(2, K, BT, H, device="cuda")
wh, wl = K_.split_weights(W, buf.dtype)
_, DA, DB = K_._split(D, H)
KP = max(16, triton.next_power_of_2(K - klo))
grid = (triton.cdiv(BT, bt), H)
K_._score_kernel[grid](buf[1], ss[1], wh, wl, S[1], klo, K, BT, D, H, D // H, eps, BLOCK_T=bt, KP=KP, DA=DA, DB=DB,
                       SPLIT=True, DOT=True, EMU=False, num_warps=nw)
torch.cuda.synchronize()
x = buf[1].float()
r = torch.rsqrt(ss[1] / D + eps)
ref = torch.einsum("thc,khc->kth", x.view(BT, H, D // H), W.view(K, H, D // H)) * r[None, :, None]
err = (S[1, klo:] - ref[klo:]).abs().max().item()
print(f"score bt={bt} nw={nw} D={D} K={K} klo={klo} KP={KP} DA={DA} DB={DB}: max err {err:.3e}", flush=True)

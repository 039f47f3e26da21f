import os, sys, time, cProfile, pstats
os.environ.setdefault("TESSERA_CACHE_DIR", "/tmp/wp/tc"); os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/wp/ic")
import torch, torch_tessera
from transformers import LlamaForCausalLM
from torch_tessera.models import llama_config
cfg = llama_config("tiny"); cfg.num_hidden_layers = 2; cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
m = LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, cfg.vocab_size, (1, 16))
f = torch.compile(m.forward, backend="tessera", dynamic=False)
pr = cProfile.Profile()
t0 = time.perf_counter()
with torch.no_grad():
    pr.enable(); f(ids); pr.disable()
print("first call", time.perf_counter() - t0)
pr.dump_stats("/tmp/wp/prof_%s" % sys.argv[1])
st = pstats.Stats(pr).stats
rows = sorted(((v[3], k) for k, v in st.items() if "torch_tessera" in k[0] or k[2] in ("compile_fx_inner", "aot_module_simplified", "_compile_fx_inner", "fx_codegen_and_compile", "load_with_key")), reverse=True)
for ct, k in rows[:30]:
    print(f"{ct:7.2f} {k[0].split('/')[-2]}/{k[0].split('/')[-1]}:{k[1]} {k[2]}")

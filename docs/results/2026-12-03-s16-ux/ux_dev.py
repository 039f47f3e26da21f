import torch, torch_tessera
m = torch.nn.Linear(4, 4)
f = torch.compile(m, backend="tessera", dynamic=False, options={"devices": "cuda:0"})
try:
    with torch.no_grad(): f(torch.randn(2, 4))
except Exception as e:
    print(type(e).__name__ + ":", e)

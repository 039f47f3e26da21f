import warnings, torch, torch_tessera
class MyNet(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(8, 8)
    def forward(self, x):
        return torch.relu(self.l(x))
m = MyNet()
f = torch.compile(m, backend="tessera", dynamic=False)
with torch.no_grad():
    for n in range(2, 8):
        f(torch.randn(n, 8))

import os, re
from torch_tessera.target import triton_work as tw
over = {k: int(v) for k, v in (kv.split("=") for kv in os.environ.get("HELPER_OPS", "").split(",") if kv)}
if over:
    orig = tw._LIBRARY
    def ops_per_element(body, _o=tw.ops_per_element):
        return _o(body)
    # patch: count each library call by name
    base_ops = tw.LIBRARY_CALL_OPS
    def patched(body):
        per_row=set(); ops=len(tw._MEMORY.findall(body))
        for line in body.splitlines():
            m=tw._ASSIGN.match(line)
            if m is None: continue
            targets=[t.strip() for t in m.group(1).split(",")]; expr=m.group(2)
            if expr.startswith("tl.full("): per_row.update(targets); continue
            refs=set(tw._TMP.findall(expr))
            if tw._REDUCE.search(expr) or ("tl.load(" not in expr and refs and refs <= per_row):
                per_row.update(targets); ops += 1 if tw._REDUCE.search(expr) else 0; continue
            calls=re.findall(r"\b(?:libdevice|tl_math|triton_helpers)\.(\w+)\(", expr)
            ops += 1 + sum(over.get(c, base_ops) for c in calls)
        return max(1, ops)
    tw.ops_per_element = patched
    import torch_tessera.target.costmodel as cm
    cm.ops_per_element = patched

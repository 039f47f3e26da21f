import re, sys
from torch_tessera.lowering.serialize import load_program
from torch_tessera.ptx.compile import compile_ptx
prog = load_program('/tmp/pf4_kt/dit_denoise.program.json')
want = sys.argv[1:]
seen=set()
for l in prog.launches:
    k = getattr(l, 'kernel', None)
    if not k or not any(k.endswith('_'+w) for w in want) or k in seen: continue
    seen.add(k)
    c = compile_ptx(prog.kernels[k], dict(l.config), 90)
    ptx = c.ptx if hasattr(c,'ptx') else c.text
    body = ptx[ptx.find('{', ptx.find('.entry')):]
    ins = [x.strip() for x in body.splitlines() if x.strip().endswith(';') and not x.strip().startswith(('.', '//'))]
    from collections import Counter
    ops = Counter((x.split()[1] if x.startswith('@') else x.split()[0]).split('.')[0] for x in ins)
    ld = [x for x in ins if 'ld.global' in x]; st=[x for x in ins if 'st.global' in x]
    print(k[-30:], l.config, 'instr', len(ins), 'ld', len(ld), 'st', len(st), ops.most_common(12))
    print('   ', set(re.sub(r'%\w+','',x.split('[')[0]) for x in ld+st))

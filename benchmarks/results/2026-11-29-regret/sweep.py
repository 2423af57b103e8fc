"""The replays behind this folder's tables: golden (g) and held-out (h) answers, total speedup
over plain and the worst answer, on two curves, for ControlConfig variants given as
"field=value;field=value" (tuples as Python literals); every answer that moved is listed.

    python benchmarks/results/2026-11-29-regret/sweep.py [VARIANT ...]
    CURVES=a,b picks other curves of tests/data/replay_curves.json; a path to a doctor report works too.
"""
import os
import json, sys, dataclasses
from multiprocessing import Pool
from localspec.control.config import DEFAULT
from localspec.control.factory import ngram_policy
from localspec.control.replay import Truth, calibration_from_doctor, replay
curves=json.load(open("tests/data/replay_curves.json"))
NAMES=os.environ.get("CURVES","smollm2-135m-q4_1,smollm2-135m-f16").split(",")
for n in NAMES:
    if n.endswith(".json"): curves[n]=json.load(open(n))
G=json.load(open("tests/data/replay_answers.json")); H=json.load(open("tests/data/heldout_answers.json"))
def run(args):
    curve, cfg = args
    cal=calibration_from_doctor(curves[curve]); truth=Truth.of(cal)
    res={}
    for tag,d in (("g",G),("h",H)):
        P=O=0; per={}
        for n,r in d["answers"].items():
            p,a=list(r["prompt"]),list(r["answer"])
            pl=truth.plain(p,a); o=replay(p,a,truth,d["n_vocab"],ngram_policy(cal.cost_curve(cfg),cfg))
            P+=pl;O+=o; per[n]=pl/o
        res[tag]=(P/O, per)
    return res
variants={"base":DEFAULT}
for spec in sys.argv[1:]:
    kw={}
    for kv in spec.split(";"):
        k,v=kv.split("="); kw[k]=eval(v) if isinstance(getattr(DEFAULT,k),tuple) else type(getattr(DEFAULT,k))(v)
    variants[spec]=dataclasses.replace(DEFAULT,**kw)
jobs=[(c,cfg) for cfg in variants.values() for c in NAMES]
with Pool(2) as pool: out=pool.map(run,jobs)
base=None
for i,name in enumerate(variants):
    q,f=out[2*i],out[2*i+1]
    def worst(r): return min(r[1].items(), key=lambda kv: kv[1])
    line=f"{name:40s} {NAMES[0][-14:]} g {q['g'][0]:.4f} h {q['h'][0]:.4f} worst {worst(q['g'])[0]}:{worst(q['g'])[1]:.3f} {worst(q['h'])[0]}:{worst(q['h'])[1]:.3f} | {NAMES[1][-14:]} g {f['g'][0]:.4f} h {f['h'][0]:.4f} worst {worst(f['g'])[1]:.3f} {worst(f['h'])[1]:.3f}"
    print(line)
    if base is None: base=(q,f)
    else:
        for lab,(a,b) in (("Q",(base[0],q)),("F",(base[1],f))):
            ch=[f"{n}:{a[t][1][n]:.3f}->{b[t][1][n]:.3f}" for t in ("g","h") for n in a[t][1] if abs(a[t][1][n]-b[t][1][n])>0.0005]
            print("   ",lab," ".join(ch))

"""The repeat task of examples/induction_heads (T = 32 random tokens of V in which a segment of 6 to
16 tokens repeats at once) trained in TransformerLens 3.9's HookedTransformer with the example's
settings (2 attention-only layers, d_model 64, 4 heads, LayerNorm, AdamW lr 3e-3, weight decay 0.01,
batch 32): prints, every tenth of the run, the training loss, the layer-0 previous-token scores and
the layer-1 induction scores. On this task neither TransformerLens nor headgrad forms the circuit
(`induction_heads --train-on repeat --vocab 48 --seq-len 32` is the same run in headgrad), which is
why the example trains on in-context Markov chains.

Usage: python3 benchmarks/induction_repeat_transformer_lens.py [V [STEPS [SEED]]]
"""
import sys
import time

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
torch.set_num_threads(1)
V=int(sys.argv[1]) if len(sys.argv)>1 else 48; T=32; PMIN=6; PMAX=16; STEPS=int(sys.argv[2]) if len(sys.argv)>2 else 1500
seed=int(sys.argv[3]) if len(sys.argv)>3 else 1
pos_type=sys.argv[4] if len(sys.argv)>4 else "standard"
torch.manual_seed(seed)
cfg=HookedTransformerConfig(n_layers=2,d_model=64,n_heads=4,d_head=16,d_vocab=V,n_ctx=T,attn_only=True,act_fn=None,normalization_type="LN",positional_embedding_type=pos_type,seed=seed)
m=HookedTransformer(cfg)
g=torch.Generator().manual_seed(seed+100)
def batch(B):
    t=torch.randint(0,V,(B,T),generator=g)
    starts=[];periods=[]
    for b in range(B):
        p=int(torch.randint(PMIN,PMAX+1,(1,),generator=g)); s=int(torch.randint(0,T-2*p+1,(1,),generator=g))
        t[b,s+p:s+2*p]=t[b,s:s+p]; starts.append(s); periods.append(p)
    return t,starts,periods
opt=torch.optim.AdamW(m.parameters(),lr=3e-3,weight_decay=0.01)
test,_,_=batch(256)
def scores():
    with torch.no_grad():
        _,cache=m.run_with_cache(test,names_filter=lambda n:n.endswith("pattern"))
    out=[]
    for l in range(2):
        P=cache[f"blocks.{l}.attn.hook_pattern"]  # B H T T
        prev=P.diagonal(offset=-1,dim1=-2,dim2=-1).mean(dim=(0,2))
        # induction: target j+1 where tok[j]==tok[i], j<i
        eq=(test[:,:,None]==test[:,None,:])  # B i j
        tri=torch.tril(torch.ones(T,T,dtype=torch.bool),-1)
        D=torch.zeros(256,T,T)
        D[:,:,1:]=(eq&tri)[:,:,:-1].float()
        has=D.sum(-1)>0
        ind=((P*D[:,None]).sum(-1))  # B H T
        ind=(ind*has[:,None]).sum((0,2))/has.sum()
        out.append((prev.tolist(),ind.tolist()))
    return out
t0=time.time()
for step in range(1,STEPS+1):
    x,_,_=batch(32)
    loss=m(x,return_type="loss")
    opt.zero_grad(); loss.backward(); opt.step()
    if step%(STEPS//10)==0:
        s=scores()
        print(step, round(loss.item(),3), "L0prev",[round(v,2) for v in s[0][0]], "L1ind",[round(v,2) for v in s[1][1]], f"{time.time()-t0:.0f}s", flush=True)

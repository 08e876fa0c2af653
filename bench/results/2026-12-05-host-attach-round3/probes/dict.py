# python3 dict.py dictzip|hash|...: the name -> view dict of 50k new names (as the packed
# manifest's split makes them) in a process of its own, thread CPU ms. Output: dict-and-names.txt.
import time, gc, sys
gc.disable()
names_txt = "".join(f"model.layers.{i//9}.{['input_layernorm','self_attn.q_proj','self_attn.k_proj','self_attn.v_proj','self_attn.o_proj','post_attention_layernorm','mlp.gate_proj','mlp.up_proj','mlp.down_proj'][i%9]}.weight\0" for i in range(50439))
vals = [object() for _ in range(50439)]
def fresh(): 
    n = names_txt.split("\0"); n.pop(); return n
how = sys.argv[1]
n = fresh()
t = time.thread_time()
if how == "dictzip": d = dict(zip(n, vals))
elif how == "hash": h = list(map(hash, n))
elif how == "hash+dict": h = list(map(hash, n)); d = dict(zip(n, vals))
elif how == "comp": d = {k: v for k, v in zip(n, vals)}
elif how == "fromkeys": d = dict.fromkeys(n); 
print(how, round((time.thread_time()-t)*1e3, 2))

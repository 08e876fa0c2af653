# python3 names-cache.py split|marshal|pickle: 50k names made by a split of their section against
# loaded from a marshal or pickle blob (what a cache keyed by fingerprint would hold). Output: dict-and-names.txt.
import time, marshal, pickle, sys
names = [f"model.layers.{i//9}.{['input_layernorm','self_attn.q_proj','self_attn.k_proj','self_attn.v_proj','self_attn.o_proj','post_attention_layernorm','mlp.gate_proj','mlp.up_proj','mlp.down_proj'][i%9]}.weight" for i in range(50439)]
blob_m = marshal.dumps(names); blob_p = pickle.dumps(names, 5); text = ("\0".join(names)+"\0").encode()
how = sys.argv[1]
t = time.thread_time()
if how == "split": out = str(text, "utf-8").split("\0")
elif how == "marshal": out = marshal.loads(blob_m)
elif how == "pickle": out = pickle.loads(blob_p)
print(how, round((time.thread_time()-t)*1e3, 2), len(blob_m), len(blob_p), len(text))

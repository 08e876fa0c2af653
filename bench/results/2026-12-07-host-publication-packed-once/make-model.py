# The checkpoint of these runs: a 20-layer Llama, hidden 512 (183 tensors, 123 MB), random, bf16.
import sys, torch, transformers
config = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=20, num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=False)
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], max_shard_size="1GB")

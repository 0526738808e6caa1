+ python3 bench/peers/llama_torch.py --data /tmp/trainrun-stream-1/data/train.bin -B 8 -T 2048 --steps 30 --skip 6 --compile --compile-mode max-autotune-no-cudagraphs

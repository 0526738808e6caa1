+ python3 bench/peers/gpt2_torch.py --data /tmp/trainrun-gpu-train/data/train.bin -B 64 -T 1024 --steps 60 --skip 12 --compile --compile-mode max-autotune --vocab 50304 --no-sync

+ python3 bench/peers/gpt2_torch.py --data /tmp/trainrun-stream-2/data/train.bin -B 64 -T 1024 --steps 60 --skip 12 --compile --tunableop --vocab 50304

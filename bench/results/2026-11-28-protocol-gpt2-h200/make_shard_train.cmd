+ python3 bench/gpu/make_shard.py --out /tmp/trainrun-gpu-train/data/train.bin --tokens 33554432 --vocab 50257 --width 2 --seed 1234

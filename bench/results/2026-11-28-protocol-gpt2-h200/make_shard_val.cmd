+ python3 bench/gpu/make_shard.py --out /tmp/trainrun-gpu-train/data/val.bin --tokens 1048576 --vocab 50257 --width 2 --seed 4321

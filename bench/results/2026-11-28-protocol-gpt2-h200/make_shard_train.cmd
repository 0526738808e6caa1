+ python3 bench/gpu/make_shard.py --out /tmp/trainrun-stream-2/data/train.bin --tokens 33554432 --vocab 50257 --width 2 --seed 1234

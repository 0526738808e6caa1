+ python3 bench/gpu/make_shard.py --out /tmp/trainrun-stream-1/data/train.bin --tokens 16777216 --vocab 128256 --width 4 --seed 1234

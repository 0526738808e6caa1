+ /work/main/peers/llmc-bin/train_gpt2cu -i /tmp/trainrun-gpu-train/data/train.bin -j /tmp/trainrun-gpu-train/data/val.bin -e d12 -b 64 -t 1024 -x 60 -v 1000000 -s 1000000 -m 1 -g 2 -c 0.1 -r 0 -ge 1

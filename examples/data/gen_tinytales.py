#!/usr/bin/env python3
"""examples/data/gen_tinytales.py: writes tinytales.txt, the small English-like
corpus examples/debug.toml trains on.

Short stories from a fixed grammar: about 300 words, a dozen sentence
templates, a hero whose name and animal friend recur through the story. The
text has structure a tiny byte-level model can learn within a minute on a
CPU (spelling, the templates, names that repeat), and it is generated here, so
the repository ships no downloaded data. The output is deterministic (a seeded
random.Random); tinytales.txt is committed, and this script regenerates it:

    python3 examples/data/gen_tinytales.py > examples/data/tinytales.txt
"""
import random
import sys

NAMES = ["Tom", "Lily", "Ben", "Mia", "Sam", "Anna", "Max", "Zoe", "Leo",
         "Emma", "Jack", "Ruby", "Finn", "Lucy", "Noah", "Ella", "Owen", "Ivy",
         "Luke", "Rose"]
HE = {n: ("she" if n in ("Lily", "Mia", "Anna", "Zoe", "Emma", "Ruby",
                          "Lucy", "Ella", "Ivy", "Rose") else "he")
      for n in NAMES}
ANIMALS = ["cat", "dog", "bird", "fox", "rabbit", "bear", "duck", "frog",
           "mouse", "owl", "horse", "goat", "fish", "bee", "turtle", "deer"]
PLACES = ["park", "garden", "forest", "river", "house", "school", "beach",
          "farm", "hill", "town", "lake", "field", "shop", "yard", "pond"]
THINGS = ["ball", "kite", "box", "book", "hat", "cake", "apple", "flower",
          "boat", "key", "drum", "cup", "shell", "stone", "bell", "toy",
          "coat", "map", "leaf", "star"]
COLORS = ["red", "blue", "green", "yellow", "white", "black", "pink",
          "brown", "orange", "purple"]
SIZES = ["big", "small", "little", "tall", "tiny", "long", "round", "soft",
         "old", "new", "shiny", "funny"]
FEELINGS = ["happy", "sad", "scared", "tired", "hungry", "excited", "angry",
            "sleepy", "proud", "calm"]
PLAY = ["played", "ran", "jumped", "danced", "sang", "laughed", "walked",
        "swam", "raced", "hid"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "bright", "cloudy"]
TIMES = ["One day", "One morning", "Once upon a time", "Last summer",
         "On a " + "{w}" + " day", "Long ago", "Early one morning"]
ENDINGS = [
    "From that day on, {n} and the {a} were best friends.",
    "{N} went home and slept well that night.",
    "{N} smiled, because it was a good day.",
    "That night, {n} dreamed about the {t}.",
    "And they all lived happily ever after.",
    "{N} learned that it is good to share.",
    "{N} learned that friends help each other.",
]


def cap(s):
    return s[0].upper() + s[1:]


def story(r):
    n = r.choice(NAMES)
    he = HE[n]
    his = "her" if he == "she" else "his"
    him = "her" if he == "she" else "him"
    a = r.choice(ANIMALS)
    p = r.choice(PLACES)
    t = r.choice(THINGS)
    c = r.choice(COLORS)
    s = r.choice(SIZES)
    f = r.choice(FEELINGS)
    w = r.choice(WEATHER)
    time = r.choice(TIMES).replace("{w}", w)
    out = []
    out.append(f"{time}, {n} went to the {p}.")
    out.append(r.choice([
        f"{cap(he)} had a {s} {c} {t}.",
        f"{cap(he)} took {his} {c} {t} with {him}.",
        f"It was a {w} day, and {he} had a {s} {t}.",
    ]))
    out.append(r.choice([
        f"At the {p}, {he} saw a {s} {a}.",
        f"Near the {p}, {n} met a {a}.",
        f"Then {n} saw a {a} under a tree.",
    ]))
    out.append(r.choice([
        f"The {a} was {f}.",
        f"The {a} looked {f}.",
        f"The {a} felt very {f}.",
    ]))
    out.append(r.choice([
        f"\"Why are you {f}?\" asked {n}.",
        f"\"Hello, {a}!\" said {n}. \"Do you want to play?\"",
        f"{n} said, \"Do not be {f}. I will help you.\"",
    ]))
    out.append(r.choice([
        f"\"I lost my {t},\" said the {a}.",
        f"The {a} said, \"I want to play with your {t}.\"",
        f"\"I have no friends,\" said the {a}.",
    ]))
    for _ in range(r.randint(1, 3)):
        v = r.choice(PLAY)
        q = r.choice(PLACES)
        out.append(r.choice([
            f"{n} and the {a} {v} in the {q}.",
            f"They {v} all day with the {c} {t}.",
            f"The {a} {v} and {n} {r.choice(PLAY)} too.",
            f"Then they went to the {q} and {v}.",
        ]))
    out.append(r.choice([
        f"Soon the {a} was not {f} anymore.",
        f"The {a} gave {n} a {r.choice(COLORS)} {r.choice(THINGS)}.",
        f"{n} gave the {t} to the {a}.",
    ]))
    out.append(r.choice(ENDINGS).format(n=n, N=n, a=a, t=t))
    return " ".join(out)


def main():
    r = random.Random(20240520)
    target = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    parts, size = [], 0
    while size < target:
        s = story(r)
        parts.append(s)
        size += len(s) + 2
    sys.stdout.write("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()

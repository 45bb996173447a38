"""Test precision of the CIFAR-10 main command's default recipe, version against version,
on a small real image data set.

    python bench/accuracy_study.py --npz=/tmp/acc/digits.npz --work=/tmp/acc/study \
        --version=before=4045d95^ --version=after=HEAD --seeds=1,2,3

The data: scikit-learn's bundled digits (1,797 real 8x8 grayscale handwritten digits,
values 0..16). --npz names a file holding `images` [N, 8, 8] and `labels` [N]; without
it the script exports them with scikit-learn if that imports (towerlib does not depend on
it: e.g. `python3 -m venv /tmp/sk && /tmp/sk/bin/pip install scikit-learn`, then
`/tmp/sk/bin/python -c "from sklearn.datasets import load_digits; import numpy as np;
d = load_digits(); np.savez('digits.npz', images=d.images, labels=d.target)"`).
Each image is scaled to 0..255, upsampled 4x (nearest) to 32x32, its gray copied to 3
channels, and written as CIFAR-10 binary records (1 label byte, 3x32x32 channel-major):
a fixed split from a seeded permutation, --test_images in test_batch.bin and the rest over
data_batch_1..5.bin.

Each --version NAME=COMMIT is checked out as a detached git worktree under --work (removed
at the end), or NAME=DIR uses a checkout that is already there. Every run is a fresh
process, one at a time, under `nice -n 19`: `python -m examples.cifar10.main
--data_dir=... --train_dir=<fresh> --seed=S` plus the version's --extra flags, i.e. the
main command's defaults otherwise. The final 'test precision@1' line is parsed. Prints a
Markdown table (each seed, median per version) and the recorded settings
(train_config.json) that differ between versions.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD_BYTES = 1 + 32 * 32 * 3
PRECISION_LINE = re.compile(
    r"final test precision@1 = ([0-9.]+) \((\d+)/(\d+)\) at global step (\d+)")


def load_digits_arrays(npz_path):
    """(images uint8 [N, 8, 8] in 0..16, labels [N]) from --npz, else from scikit-learn."""
    if npz_path:
        with np.load(npz_path) as f:
            return np.asarray(f["images"]), np.asarray(f["labels"])
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("error: give --npz=<digits.npz> or run where scikit-learn imports "
                 "(see this script's docstring).")
    digits = load_digits()
    return digits.images, digits.target


def to_cifar_records(images, labels):
    """8x8 gray in 0..16 -> CIFAR-10 records: uint8 [N, 3073]."""
    gray = np.clip(np.rint(np.asarray(images, np.float64) * 255.0 / 16.0), 0, 255)
    big = gray.astype(np.uint8).repeat(4, axis=1).repeat(4, axis=2)  # [N, 32, 32]
    chw = np.repeat(big[:, None, :, :], 3, axis=1)  # [N, 3, 32, 32], channel-major
    records = np.empty((len(labels), RECORD_BYTES), np.uint8)
    records[:, 0] = np.asarray(labels, np.uint8)
    records[:, 1:] = chw.reshape(len(labels), -1)
    return records


def write_cifar_files(images, labels, out_dir, test_images, split_seed):
    """Writes out_dir/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin; returns
    (train count, test count)."""
    records = to_cifar_records(images, labels)
    order = np.random.default_rng(split_seed).permutation(len(records))
    test, train = records[order[:test_images]], records[order[test_images:]]
    batches = os.path.join(out_dir, "cifar-10-batches-bin")
    os.makedirs(batches, exist_ok=True)
    test.tofile(os.path.join(batches, "test_batch.bin"))
    for i, part in enumerate(np.array_split(train, 5)):
        part.tofile(os.path.join(batches, "data_batch_%d.bin" % (i + 1)))
    return len(train), len(test)


def git(*args):
    return subprocess.run(["git", "-C", REPO] + list(args), check=True,
                          capture_output=True, text=True).stdout.strip()


def prepare_versions(specs, work):
    """[(name, checkout dir, commit, made_here)] for NAME=COMMIT or NAME=DIR specs."""
    versions = []
    for spec in specs:
        name, _, where = spec.partition("=")
        if os.path.isdir(where):
            commit = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], check=True,
                                    capture_output=True, text=True).stdout.strip()
            versions.append((name, os.path.abspath(where), commit, False))
            continue
        commit = git("rev-parse", where + "^{commit}")
        tree = os.path.join(work, "tree-" + name)
        git("worktree", "add", "--detach", tree, commit)
        versions.append((name, tree, commit, True))
    return versions


def run_once(tree, data_dir, train_dir, seed, extra, python, log_path):
    """One main-command run in a fresh process; returns a dict of its figures."""
    shutil.rmtree(train_dir, ignore_errors=True)
    cmd = ["nice", "-n", "19", python, "-m", "examples.cifar10.main",
           "--data_dir=" + data_dir, "--train_dir=" + train_dir,
           "--seed=%d" % seed] + list(extra)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=tree)  # its own code
    start = time.time()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        status = subprocess.run(cmd, cwd=tree, env=env, stdout=log,
                                stderr=subprocess.STDOUT).returncode
    seconds = time.time() - start
    with open(log_path) as log:
        found = PRECISION_LINE.findall(log.read())
    if status or not found:
        raise RuntimeError("run failed (status %d); see %s" % (status, log_path))
    precision, correct, total, step = found[-1]
    config_path = os.path.join(train_dir, "train_config.json")
    config = json.load(open(config_path)) if os.path.exists(config_path) else {}
    return {"precision": float(precision), "correct": int(correct), "total": int(total),
            "step": int(step), "seconds": seconds, "config": config}


def settings_that_differ(configs):
    """{key: {version: value}} for the recorded settings that differ between versions
    (paths and the seed left out)."""
    skip = {"train_dir", "data_dir", "seed"}
    keys = set().union(*[c.keys() for c in configs.values()]) - skip
    differ = {}
    for key in sorted(keys):
        values = {name: c.get(key, "(absent)") for name, c in configs.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            differ[key] = values
    return differ


def markdown(results, versions, seeds, train_count, test_count):
    lines = ["| version | commit | " + " | ".join("seed %d" % s for s in seeds)
             + " | median | mean | seconds per run (median) |",
             "| --- | --- |" + " ---: |" * (len(seeds) + 3)]
    for name, _, commit, _ in versions:
        runs = [results[(name, s)] for s in seeds]
        cells = ["%.4f (%d/%d)" % (r["precision"], r["correct"], r["total"]) for r in runs]
        values = [r["precision"] for r in runs]
        lines.append("| %s | %s | %s | **%.4f** | %.4f | %.0f |" % (
            name, commit[:7], " | ".join(cells), statistics.median(values),
            statistics.mean(values), statistics.median(r["seconds"] for r in runs)))
    lines.append("")
    lines.append("Data: scikit-learn digits, %d training and %d test images; global "
                 "steps per run: %s." % (train_count, test_count, ", ".join(sorted(
                     {"%s %d" % (n, results[(n, s)]["step"]) for n, _, _, _ in versions
                      for s in seeds}))))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--npz", default="", help="digits as images/labels arrays")
    parser.add_argument("--work", default="/tmp/accuracy_study", help="scratch folder")
    parser.add_argument("--version", action="append", default=[],
                        help="NAME=COMMIT (a worktree is made) or NAME=DIR (a checkout)")
    parser.add_argument("--extra", action="append", default=[],
                        help="NAME=FLAGS: more main-command flags for that version, "
                             "space-separated (e.g. 'after-old=--lr_decay_epochs=8,12')")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--test_images", type=int, default=300)
    parser.add_argument("--split_seed", type=int, default=0)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--keep_runs", action="store_true",
                        help="keep each run's train_dir (checkpoints, export)")
    args = parser.parse_args()
    specs = args.version or ["before=4045d95^", "after=HEAD"]
    extras = {}
    for item in args.extra:
        name, _, flags = item.partition("=")
        extras[name] = flags.split()
    seeds = [int(s) for s in args.seeds.split(",")]

    os.makedirs(args.work, exist_ok=True)
    data_dir = os.path.join(args.work, "digits_cifar")
    images, labels = load_digits_arrays(args.npz)
    train_count, test_count = write_cifar_files(images, labels, data_dir,
                                                args.test_images, args.split_seed)
    versions = prepare_versions(specs, args.work)
    results = {}
    try:
        for seed in seeds:  # seed-major: load from elsewhere falls on all versions alike
            for name, tree, commit, _ in versions:
                train_dir = os.path.join(args.work, "runs", "%s-seed%d" % (name, seed))
                log_path = os.path.join(args.work, "%s-seed%d.log" % (name, seed))
                result = run_once(tree, data_dir, train_dir, seed, extras.get(name, []),
                                  args.python, log_path)
                results[(name, seed)] = result
                print("%s seed %d: precision %.4f (%d/%d), step %d, %.0f s" % (
                    name, seed, result["precision"], result["correct"], result["total"],
                    result["step"], result["seconds"]), flush=True)
                if not args.keep_runs:
                    shutil.rmtree(train_dir, ignore_errors=True)
    finally:
        for name, tree, _, made_here in versions:
            if made_here:
                git("worktree", "remove", "--force", tree)
    print()
    print(markdown(results, versions, seeds, train_count, test_count))
    differ = settings_that_differ(
        {name: results[(name, seeds[0])]["config"] for name, _, _, _ in versions})
    print()
    print("Recorded settings (train_config.json) that differ: " + (
        "; ".join("%s: %s" % (k, ", ".join("%s %s" % (n, json.dumps(v))
                                            for n, v in vals.items()))
                  for k, vals in differ.items()) or "none"))


if __name__ == "__main__":
    main()

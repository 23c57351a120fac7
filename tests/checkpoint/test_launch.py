"""The generated launch.sh in multi-node mode, on one machine: two "nodes" of 2 ranks.

Both run ``./launch.sh --nnodes 2 --node-rank I --head-node 127.0.0.1:PORT`` (node 1
through the environment instead of flags), meet at the c10d rendezvous on loopback,
and train dp2 × tp2; the losses match the dp2 run of the same model within 1e-5.
Also: slurm.sbatch is valid bash that takes the head node from the allocation, and a
checkpoint folder written in the spec reaches train.py and slurm.sbatch as plain text.
"""

from __future__ import annotations

import ast
import subprocess

from .trainer import TORCHRUN, build, env, free_port, losses, records


def test_launch_two_nodes_over_loopback(straight, tmp_path):
    build_dir = build("dp2", tmp_path / "build",
                      extra=("parallel.tp=2", "mesh.nodes=2", "mesh.devices_per_node=2"))
    port, metrics = free_port(), tmp_path / "metrics.jsonl"
    common = env(TORCHRUN=str(TORCHRUN), MAX_RESTARTS="0")
    node0 = subprocess.Popen(
        ["./launch.sh", "--nnodes", "2", "--node-rank", "0", "--head-node", f"127.0.0.1:{port}",
         "--steps", "2", "--metrics-jsonl", str(metrics)],
        cwd=build_dir, env=common, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    node1 = subprocess.Popen(
        ["./launch.sh", "--steps", "2"], cwd=build_dir,
        env=dict(common, NNODES="2", NODE_RANK="1", HEAD_NODE="127.0.0.1", HEAD_PORT=str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        outputs = [node.communicate(timeout=300)[0] for node in (node0, node1)]
    finally:
        for node in (node0, node1):  # only the processes started here
            if node.poll() is None:
                node.kill()
                node.wait()
    assert node0.returncode == 0 and node1.returncode == 0, "\n".join(o[-3000:] for o in outputs)
    loss, reference = losses(records(metrics)), losses(straight("dp2").rows)
    assert sorted(loss) == [1, 2]
    for step in (1, 2):
        assert abs(loss[step] - reference[step]) <= 1e-5 * abs(reference[step]), (step, loss, reference)


def test_slurm_script_is_bash_with_the_allocation_head_node(tmp_path):
    build_dir = build("dp2", tmp_path / "build", extra=("mesh.nodes=2", "mesh.devices_per_node=1"))
    script = (build_dir / "slurm.sbatch").read_text()
    subprocess.run(["bash", "-n", str(build_dir / "slurm.sbatch")], check=True)
    assert "#SBATCH --nodes=2" in script and "--nproc-per-node 1" in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in script
    assert '--rdzv-endpoint "$HEAD_NODE:$HEAD_PORT"' in script and "srun" in script


def test_a_hostile_checkpoint_dir_stays_text(tmp_path):
    hostile = "ck $(touch pwned); `id` 'q' \\\"d\\\""  # the spec's string, escapes included
    build_dir = build("one", tmp_path / "build", extra=(f'train.checkpoint=every(2, dir = "{hostile}")',))
    text = hostile.replace('\\"', '"')
    source = (build_dir / "train.py").read_text()
    line = next(l for l in source.splitlines() if l.startswith("CHECKPOINT_DIR = "))
    assert ast.literal_eval(line.removeprefix("CHECKPOINT_DIR = ").split("  #")[0]) == text
    ast.parse(source)
    assign = next(l for l in (build_dir / "slurm.sbatch").read_text().splitlines()
                  if l.startswith("SPEC_CHECKPOINT_DIR="))
    echoed = subprocess.run(["bash", "-c", assign + '\nprintf %s "$SPEC_CHECKPOINT_DIR"'], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout
    assert echoed == text and not (tmp_path / "pwned").exists()

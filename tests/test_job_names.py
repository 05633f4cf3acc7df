"""A job is named after what it runs, and the TUI's history keeps what the user typed."""

from __future__ import annotations

import pytest

from gpumon.cards.backends.demo import DemoBackend
from gpumon.jobs import command_history
from gpumon.jobs.launch import prepare, program_name, shell_request, start


@pytest.mark.parametrize("argv, name", [
    (["python", "train.py", "--epochs", "3"], "train.py"),
    (["/usr/bin/python3.11", "-u", "scripts/train.py"], "train.py"),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "x"], "vllm.entrypoints.openai.api_server"),
    (["env", "CUDA_LAUNCH_BLOCKING=1", "python", "train.py"], "train.py"),
    (["/bin/sh", "-c", "cd ~/llm && make -j8"], "make"),
    (["/bin/sh", "-c", "OMP_NUM_THREADS=4 torchrun --nproc 2 pretrain.py"], "pretrain.py"),
    (["nohup", "nice", "-n", "10", "./sim", "--steps", "9"], "sim"),
    (["uv", "run", "python", "eval.py"], "eval.py"),
    ([], "job"),
    # Code given inline names nothing: the interpreter or shell is the program.
    (["sh", "-c", "env | grep CUDA"], "sh"),
    (["python3", "-c", "import torch; print(torch.cuda.is_available())"], "python3"),
    (["python3", "-W", "ignore", "-c", "print(1)"], "python3"),
    (["perl", "-e", "print 1"], "perl"),
    (["sh", "-c", "for i in 1 2; do echo $i; done"], "sh"),
    (["env"], "env"),
    # A script argument still names the job, also after set-up commands or before a pipe.
    (["bash", "-lc", "source venv/bin/activate && python train.py"], "train.py"),
    (["bash", "-o", "pipefail", "-c", "python train.py | tee log"], "train.py"),
    (["bash", "run.sh"], "run.sh"),
    (["torchrun", "--nproc_per_node=8", "train.py", "-c", "cfg.yaml"], "train.py"),
    (["python", "-u", "-m", "mod"], "mod"),
])
def test_program_name(argv, name):
    assert program_name(argv) == name


def test_history_keeps_the_typed_command_not_the_shell_wrapper(tmp_path):
    backend = DemoBackend()
    typed = "python train.py --lr 3e-4 | tee log.txt"
    request = shell_request(typed, "0", cwd=str(tmp_path))
    spec = prepare(request, backend.sample(), None, {"demo": "default"})
    assert spec.command == ["/bin/sh", "-c", typed]
    assert spec.name == "train.py"
    start(spec, foreground=True, typed=request.typed)  # records it without starting a supervisor
    assert command_history.command_history()[0] == typed


def test_a_typed_pipeline_of_inline_words_is_named_after_the_shell():
    assert shell_request("env | grep CUDA", "0").name == "sh"
    assert shell_request("cd /tmp && nvidia-smi -L", "0").name == "nvidia-smi"

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for every trainer test in the session (saves ~5 s per run)."""
    import os

    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """(checkpoint, dataset dir) of a briefly trained micro TransformerLM, shared by trainer tests."""
    from trainer_fixtures import make_base, make_dataset

    tmp = tmp_path_factory.mktemp("tiny_base")
    base, _ = make_base(tmp)
    return str(base), str(make_dataset(tmp / "data"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one intra-op thread is as fast and does not spin against other jobs on a
    shared 2-core machine. Restored after the module (opt in with ``pytest.mark.usefixtures``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for every trainer test in the session (saves ~5 s per run)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", configure_logging=False)
    yield
    ray.shutdown()

"""Step 6: the plugin's own tests, registered in-process and run on the CPU."""

import omni_hello.plugin as hello

from omni_core.testing import plan_on_cpu


def test_the_plugin_registers_its_pipeline_policy_and_transport(plugins):
    with plugins.registered(hello, "omni_hello.plugin") as name:
        (row,) = [r for r in plugins.listing() if r["name"] == name]
    assert row["error"] is None
    assert row["pipelines"] == ["hello"]
    assert row["placement_policies"] == ["spread-replicas"]
    assert row["transports"] == ["traced"]


def test_a_request_runs_through_both_processes(plugins, short_tmp):
    with plugins.registered(hello, "omni_hello.plugin"):
        planned = plan_on_cpu(plugins, short_tmp, pipeline="hello")
        outputs = planned.run({"name": "ada"})
    assert outputs["shout"]["text"] == "HELLO, ADA!"

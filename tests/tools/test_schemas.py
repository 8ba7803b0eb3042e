"""Our agent_toolset input schemas and descriptions equal the SDK's."""

from __future__ import annotations

from anthropic.lib.tools.agent_toolset import AgentToolContext, beta_agent_toolset_20260401
from anthropic.types.beta import (
    BetaManagedAgentsAgentToolset20260401BashInput,
    BetaManagedAgentsAgentToolset20260401EditInput,
    BetaManagedAgentsAgentToolset20260401GlobInput,
    BetaManagedAgentsAgentToolset20260401GrepInput,
    BetaManagedAgentsAgentToolset20260401ReadInput,
    BetaManagedAgentsAgentToolset20260401WriteInput,
)
from stockade.tools.builtin import agent_toolset

MODELS = {
    "bash": BetaManagedAgentsAgentToolset20260401BashInput,
    "read": BetaManagedAgentsAgentToolset20260401ReadInput,
    "write": BetaManagedAgentsAgentToolset20260401WriteInput,
    "edit": BetaManagedAgentsAgentToolset20260401EditInput,
    "glob": BetaManagedAgentsAgentToolset20260401GlobInput,
    "grep": BetaManagedAgentsAgentToolset20260401GrepInput,
}


def test_input_schemas_equal_the_sdk_types() -> None:
    assert [t.name for t in agent_toolset] == list(MODELS)
    for t in agent_toolset:
        assert t.input_schema == MODELS[t.name].model_json_schema(), t.name


def test_definitions_equal_the_sdk_reference_toolset() -> None:
    sdk = [t.to_dict() for t in beta_agent_toolset_20260401(AgentToolContext(workdir="/"))]
    ours = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in agent_toolset
    ]
    assert ours == sdk

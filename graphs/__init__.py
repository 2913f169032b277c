"""LangGraph graphs: the text-env agent, a generic tool agent, the hindsight-skill node
and a prebuilt ReAct calculator example."""

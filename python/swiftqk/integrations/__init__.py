"""Integrations of SwiftQK's tensor-parallel QK norm with model libraries.

``swiftqk.integrations.transformers.apply_swiftqk_tp`` shards Hugging Face transformers' OLMo 2,
OLMo 3, FlexOlmo, OLMoE and Olmo3-MoE attention by heads with SwiftQK's norm on the local shards.
"""

"""Is a card going bad: the rules table and verdicts, what the counters did lately, and NVIDIA's
XID catalogue. Pure data and rules: the counters themselves come from the card backends.
"""

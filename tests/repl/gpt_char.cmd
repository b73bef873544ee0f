# ARGS: examples/gpt_char.epl -np 8
# A session on the char-GPT: the mesh, a stage, a layer, the schedule; ZeRO 3 re-planned
# with its diff and ledger; a setting that does not plan, kept out; -np 4; back again.
mesh
stage 1
explain transformer_block
schedule
set policy.zero = 3
mem
set policy.micro_batches = 3
settings
set np = 4
reset
check
rank 9

"""Prints a StreamPipeline's plan and conditions (kubectl get streampipeline NAME -o json | this)."""
import json
import sys

sp = json.load(sys.stdin)
st = sp["status"]
p = st["plan"]
print(f'plan: {p["connections"]} connections, predicted {st["predictedGbps"]} Gbit/s raw, '
      f'bottleneck {p["bottleneck"]}; gateway NIC on NUMA node {p["nicNUMANode"]}')
for n in p["nodes"]:
    stages = ", ".join(f'{s["stage"]} x{s["threads"]} @{s["numa"]}' for s in n["stages"])
    print(f'  {n["role"]:8} {n["node"]:11} {n["cpus"]:3} CPUs  {stages}')
for c in st["conditions"]:
    print(f'  {c["type"]:9} {c["status"]:7} {c["reason"]}: {c["message"]}')

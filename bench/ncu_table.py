"""ncu's --csv output (standard input) as one line a kernel launch: its ID, name and the metrics asked for.

    ncu --csv --metrics a,b,c python script.py | python bench/ncu_table.py"""
import csv
import sys

rows: dict[str, dict[str, str]] = {}
names: dict[str, str] = {}
metrics: list[str] = []
for record in csv.DictReader(line for line in sys.stdin if line.startswith('"')):
    launch = record["ID"]
    names[launch] = record["Kernel Name"][:48]
    metric = f'{record["Metric Name"]} ({record["Metric Unit"]})'
    if metric not in metrics:
        metrics.append(metric)
    rows.setdefault(launch, {})[metric] = record["Metric Value"]
print("ID | kernel | " + " | ".join(metrics))
for launch, values in rows.items():
    print(f"{launch} | {names[launch]} | " + " | ".join(values.get(m, "") for m in metrics))

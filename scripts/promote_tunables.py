"""Make an evolution's winner the variant's defaults: rewrite the `default:` of each tunable the
search changed from the defaults it measured in kernels/<variant>/variant.yaml (comments and
layout kept). Not a stage: run it by hand after reading best.json, then rerun the pipeline."""
from evo_sdpa.cli import parser
from evo_sdpa.errors import StageError, run_stage
from evo_sdpa.io import read_json, write_text
from evo_sdpa.tunables import changed, promote_defaults, resolve
from evo_sdpa.variants import KERNELS_DIR, METADATA_FILE, load_variant


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--best", required=True, help="results/evolve/<variant>/best.json")
    args = p.parse_args()
    best = read_json(args.best)
    winner = best.get("winner")
    if best.get("variant") != args.variant or not winner:
        raise StageError(f"{args.best}: no winner of {args.variant} to promote (status {best.get('status')!r})")
    if winner.get("source_dir"):
        raise StageError(f"{args.best}: the winner is a proposer's code ({winner['source_dir']}): "
                         "review and copy that folder over the variant by hand")
    if not isinstance(winner.get("tunables"), dict):
        raise StageError(f"{args.best}: its winner {winner.get('id', '?')!r} names no tunables (a best.json the "
                         "evolve rule did not write?); rerun that rule to write it again")
    variant = load_variant(KERNELS_DIR / args.variant)
    # What the search changed from the defaults it measured, not its whole configuration: a default
    # edited by hand since then stays as edited.
    search_changed = winner.get("changed_from_defaults")
    updates = changed(variant, resolve(variant, search_changed if isinstance(search_changed, dict) else winner["tunables"]))
    path = variant.folder / METADATA_FILE
    write_text(path, promote_defaults(path.read_text(), updates))
    load_variant(KERNELS_DIR / args.variant)  # still valid
    print(f"{path}: " + (", ".join(f"{k} -> {v}" for k, v in updates.items()) or "already the defaults"))


if __name__ == "__main__":
    run_stage(main)

"""Stage: SDPA's own error on every case of the parity tier, once per card for every variant's
parity job (each variant's bound is a multiple of it)."""
from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.device import cuda_available
from evo_sdpa.errors import run_stage
from evo_sdpa.io import write_json
from evo_sdpa.parity import sdpa_table, tier_name
from evo_sdpa.provenance import stamp


def main() -> None:
    p = parser(__doc__)
    config_arg(p)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    log = setup_logging()
    hold_card("sdpa_parity", log)
    parity = args.config_json["parity"]
    device = "cuda" if cuda_available() else "cpu"
    tier = tier_name(parity, device == "cuda")
    table = sdpa_table(tier, parity["tiers"][tier], parity["sdpa_table"], device)
    stamp(table, measured_on_card=True)
    log.info("sdpa_parity: SDPA's error on %d cases (tier %s on %s)", len(table["errors"]), tier, device)
    write_json(args.out, table)


if __name__ == "__main__":
    run_stage(main)

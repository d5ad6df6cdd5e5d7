"""Stage: capture the environment (device, versions, git state, measured ceilings)."""
from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import parser, setup_logging
from evo_sdpa.envinfo import capture
from evo_sdpa.errors import run_stage
from evo_sdpa.io import write_json


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    log = setup_logging()
    lock = hold_card("env_capture", log)
    env = capture()
    env["lock"] = lock
    log.info("device: %s", env["device"]["name"] if env["device"] else env["not_measured"])
    write_json(args.out, env)


if __name__ == "__main__":
    run_stage(main)

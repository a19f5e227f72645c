"""``tvm-ext targets``: what ``--target llvm`` and the other presets resolve to here."""


def add_parser(sub) -> None:
    p = sub.add_parser("targets", help="print the detected host CPU and the target presets",
                       description="Print the host CPU that '--target llvm' is built for "
                                   "(LLVM mcpu, vector features, physical cores) and the presets.")
    p.set_defaults(func=run)


def run(args) -> int:
    from tvm_ext.targets import print_targets

    return print_targets()

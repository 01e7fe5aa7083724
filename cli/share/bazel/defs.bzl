"""urewrite_binary and urewrite_library: a probed copy of a program or shared library.

    load("@urewrite//:defs.bzl", "urewrite_binary")

    cc_binary(name = "server", srcs = ["server.c"])

    urewrite_binary(
        name = "server_probed",
        src = ":server",
        probes = ["handle_request", "parse_*"],
    )

The rewrite is one action (mnemonic Urewrite) whose inputs are the src file and the urewrite
tool, whose output is the probed file, and whose command line holds every setting: Bazel caches
it, locally or remotely, like any other action, and re-runs it when the src or the settings
change. It runs sandboxed without network. What it takes from the host (python3 and the urewrite
package installed for it) is described in docs/bazel.md and urewrite_tool.sh.
"""

# The urewrite release these rules ship with (urewrite/__init__.py says the same; a test checks).
# It is on every action's command line, so a new urewrite never reuses an old one's outputs.
UREWRITE_VERSION = "0.1.0"

def _urewrite_impl(ctx):
    if not (ctx.attr.probes or ctx.attr.returns or ctx.attr.usdt or ctx.attr.program):
        fail("give at least one of probes, returns, usdt, program")
    if bool(ctx.attr.call) != bool(ctx.attr.call_function):
        fail("call and call_function go together")
    src = ctx.file.src
    out = ctx.outputs.out
    if out == None:
        out = ctx.actions.declare_file(ctx.label.name)

    args = ctx.actions.args()
    args.add(UREWRITE_VERSION)
    args.add(src)
    args.add_all(ctx.attr.probes, before_each = "-p")
    args.add_all(ctx.attr.returns, before_each = "-r")
    args.add_all(
        [u if u.startswith("usdt:") else "usdt:" + u for u in ctx.attr.usdt],
        before_each = "-p",
    )
    if ctx.attr.keep_going:
        args.add("--keep-going")
    inputs = [src]
    if ctx.attr.program:
        args.add("-f", ctx.file.program)
        inputs.append(ctx.file.program)
    if ctx.attr.call:
        args.add("--call", "%s:%s" % (ctx.file.call.path, ctx.attr.call_function))
        inputs.append(ctx.file.call)
    args.add_all(ctx.attr.options)
    args.add("-q")
    args.add("-o", out)

    ctx.actions.run(
        executable = ctx.executable.urewrite,
        arguments = [args],
        inputs = inputs,
        outputs = [out],
        mnemonic = "Urewrite",
        progress_message = "Instrumenting %s with urewrite" % src.short_path,
        # For the PATH that finds python3, and --action_env=UREWRITE_PYTHON.
        use_default_shell_env = True,
        execution_requirements = {"block-network": "1"},
    )

    runfiles = ctx.runfiles(files = [out]).merge(ctx.attr.src[DefaultInfo].default_runfiles)
    return [DefaultInfo(
        files = depset([out]),
        runfiles = runfiles,
        executable = out if ctx.attr._executable else None,
    )]

def _attrs(executable):
    return {
        "src": attr.label(
            mandatory = True,
            allow_single_file = True,
            doc = "The program or shared library to rewrite (one file).",
        ),
        "probes": attr.string_list(
            doc = "Entry probes: function names, globs ('parse_*') or addresses (urewrite -p).",
        ),
        "returns": attr.string_list(
            doc = "Functions to probe at every return (urewrite -r).",
        ),
        "usdt": attr.string_list(
            doc = "USDT probes as provider:name (urewrite -p usdt:provider:name).",
        ),
        "keep_going": attr.bool(
            default = False,
            doc = "Skip sites that cannot be patched safely, even when named exactly.",
        ),
        "program": attr.label(
            allow_single_file = True,
            doc = "A probe program (bpftrace's language) built into the probes, with the " +
                  "probes it names (urewrite -f).",
        ),
        "call": attr.label(
            allow_single_file = [".c", ".o"],
            doc = "A C file (or object file) whose call_function runs at every probe " +
                  "(urewrite --call); it is compiled by the host's C compiler.",
        ),
        "call_function": attr.string(doc = "The function of call."),
        "options": attr.string_list(doc = "Further urewrite arguments, passed as given."),
        "out": attr.output(doc = "The file to write; default: the target's name."),
        "urewrite": attr.label(
            default = Label("//:urewrite_tool"),
            executable = True,
            cfg = "exec",
            doc = "The program that runs urewrite (default: python3 -m urewrite from the host).",
        ),
        "_executable": attr.bool(default = executable),
    }

def _tool_impl(ctx):
    # A copy of the script made executable whatever its mode in the installed package; a
    # Starlark rule rather than sh_binary, which Bazel 4.2 cannot build offline (its launcher
    # needs rules_cc).
    out = ctx.actions.declare_file(ctx.label.name)
    ctx.actions.expand_template(
        template = ctx.file.src,
        output = out,
        substitutions = {},
        is_executable = True,
    )
    return [DefaultInfo(executable = out, files = depset([out]))]

urewrite_tool = rule(
    implementation = _tool_impl,
    attrs = {"src": attr.label(mandatory = True, allow_single_file = True)},
    executable = True,
    doc = "The program the rules run: a script, made executable.",
)

urewrite_binary = rule(
    implementation = _urewrite_impl,
    attrs = _attrs(True),
    executable = True,
    doc = "A probed copy of a program: `bazel run` runs it, `bazel build` writes it.",
)

urewrite_library = rule(
    implementation = _urewrite_impl,
    attrs = _attrs(False),
    doc = "A probed copy of a shared library (give `out` the library's file name).",
)

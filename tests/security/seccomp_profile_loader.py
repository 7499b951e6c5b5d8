"""``/usr/bin/python3 seccomp_profile_loader.py PROFILE.json [--drop GROUP] -- COMMAND…``: loads an
OCI seccomp profile (the JSON runc reads) into this process with libseccomp's Python binding
(Debian ``python3-seccomp``), the way runc does for a container (unknown syscall names skipped,
``SCMP_CMP_EQ`` argument rules, ``no_new_privs`` set), then execs COMMAND under it. ``--drop`` leaves
out the rule whose ``comment`` is GROUP (e.g. the sandbox's own calls, as the runtime's default
profile refuses them). Used by tests/security/test_worker_seccomp_profile.py; run by the system
Python, which has the binding, not by the project's virtualenv."""

import json
import os
import sys

import seccomp


def main(argv: list[str]) -> None:
    split = argv.index("--")
    options, command = argv[1:split], argv[split + 1 :]
    profile = json.loads(open(options[0]).read())
    drop = options[options.index("--drop") + 1] if "--drop" in options else None
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    filt = seccomp.SyscallFilter(defaction=seccomp.ERRNO(profile.get("defaultErrnoRet", 1)))
    for rule in profile["syscalls"]:
        if rule.get("comment") == drop or rule["action"] != "SCMP_ACT_ALLOW":
            continue
        args = [seccomp.Arg(a["index"], seccomp.EQ, a["value"]) for a in rule.get("args", [])]
        for name in rule["names"]:
            try:
                filt.add_rule(seccomp.ALLOW, name, *args)
            except (RuntimeError, ValueError, OSError):
                pass  # not a syscall of this architecture: runc skips it too
    filt.load()
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv)

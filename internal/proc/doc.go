// Package proc runs the servers that tests and the stack's tooling start,
// and waits for them:
//
//   - Start runs a supervised child: its own process group (so whatever it
//     forks goes down with it), SIGKILLed by the kernel when its parent dies
//     (Linux), reaped in the background so Exited tells when its ports are
//     free. Test harnesses use it.
//   - Daemon is a detached server known by its pid file, which outlives the
//     program that started it (each stackctl call is one Terraform
//     provisioner): the pid file, the binary recorded beside the pid and
//     /proc are the only truth about whether it runs.
//   - Tail is the end of a server's log, for error messages.
//   - Poll is the one wait-until loop: it retries a check until it passes,
//     fails for good (Permanent) or the context ends.
package proc

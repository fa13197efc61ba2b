// Package handoff lets a new edge binary take over the listening sockets of
// the running one, so an upgrade refuses no connection:
//
//  1. On SIGUSR2 the running edge starts its binary again (the path re-read
//     from disk, the same arguments and environment) with its listening
//     sockets as inherited file descriptors from 3, named in
//     EDGEGUARD_LISTEN_FDS (public:tls:admin:rls:ready), the last one a pipe.
//  2. The new edge uses those sockets instead of binding (Inherited), and
//     once it answers ready it writes to the pipe (Ready).
//  3. The old edge, told ready, stops accepting and drains; told nothing
//     (the new binary refused to start or died), it kills what is left of
//     the new one and keeps serving.
//
// The same sockets may come from systemd's socket activation instead
// (LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES, as sd_listen_fds(3) describes).
package handoff

// Package reliability is konnect's black-box reliability and security matrix. Its tests build
// ./cmd/konnect and drive the binary as users do: they kill konnect init and konnect certs renew at random
// points, give every command bad input, send hostile and slow clients to every listener, present wrong
// credentials and certificates to the tunnel, grep the daemons' logs for secrets, and run a churn soak of
// two servers and two agents. docs/reliability.md lists each case with the test that shows it.
//
// It is not for unit behaviour of one package (each package tests its own bad input from the inside), nor
// for the real kube-apiserver chain, which test/e2e runs; where kube-apiserver's own answers matter (a
// TokenReview flood), it runs etcd and kube-apiserver alone on loopback. The tests expect root (bind mounts, tmpfs, sshd)
// and fail, never skip, without it.
package reliability

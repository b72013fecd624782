// Package e2e runs konnect against the real programs its users run: etcd,
// kube-apiserver 1.36, k8s.io/sample-apiserver, OpenSSH sshd, kubectl and the
// upstream Konnectivity binaries, each in its own Linux network namespace.
//
// The tests sit behind the build tag e2e and need root. They are not unit
// tests: they start whole clusters and take minutes. Run them with
//
//	bash test/e2e/tools/build.sh
//	go test -tags e2e -count=1 -timeout 40m ./test/e2e/
//
// and one scenario alone with -run, e.g. -run 'TestGRPCOverUDS'. With
// KONNECT_E2E_KEEP=1 the namespaces, processes and files of a run are left in
// place and the test log says how to enter them.
//
// The package holds no production code; this file exists so that the package
// has a doc comment in builds without the e2e tag.
package e2e

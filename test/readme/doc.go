// Package readme runs README.md's examples and `make demo` (hack/demo.sh), so that neither can rot. It holds
// tests only.
//
// TestREADME extracts every ```sh block of README.md and runs it with bash, in order, in a temporary
// directory that looks like a checkout (the repository's files, linked) with bin/konnect built from this
// tree. Paths under /tmp/, which the README tells the reader to choose, are moved into the temporary directory;
// nothing else is rewritten. An HTML comment on the line right before a block changes how it runs:
//
//	<!-- needs: WHAT IT NEEDS, covered by TestName[, TestOther] -->
//
// The block is not run here: it needs what this test does not have (a cluster, an SSH server, root,
// make test itself). Each test it names must exist in the repository, and should do what the block does.
//
//	<!-- daemon: ready at http://127.0.0.1:PORT/PATH -->
//
// The block is one long-running command (a server, an agent): it starts in the background, must answer 200
// at the URL within a minute, keeps running while the later blocks run (a reader leaves it running in a
// terminal of its own), and must exit 0 on SIGTERM at the end.
//
// Any other comment right before a block is an error, so that a mistyped marker cannot hide a block.
package readme

// Command hello is the program of the image TestContainerd builds and runs: it says who it runs as.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("hello uid=%d gid=%d args=%q\n", os.Getuid(), os.Getgid(), os.Args[1:])
}

package bpf

// MaxAllow is the number of prefixes the kernel's allowlist holds (MAX_ALLOW
// in rakelimit.c; Load checks that the object agrees). This file has no build
// constraint so that configuration checks on every platform can name it.
const MaxAllow = 1024

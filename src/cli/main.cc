#include <cstdio>
int main() { std::puts("agentkv"); return 0; }

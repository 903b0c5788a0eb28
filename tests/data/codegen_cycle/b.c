/* Fixture for codegen_calls.py --fail-on-cycle: b calls a back. */
int fa(void);
int fb(void);
int fb(void) { return fa() - 1; }

/* Fixture for codegen_calls.py --fail-on-cycle: a calls b, b calls a. */
int fa(void);
int fb(void);
int fa(void) { return fb() + 1; }

"""C source of the helper functions a C-style kernel defines once (render_c.py fills the templates per dtype):
NaN-propagating max/min, flooring integer // and % (x // 0 == x % 0 == 0), float %, bfloat16 conversions
bit-equal to ml_dtypes, float16 widening that keeps a NaN's sign and payload, one rounding to 16-bit floats through a float rounded to odd, saturating float -> int casts."""

FMAX = "{t} pj_{name}_{n}({t} a, {t} b) {{ return (a != a || b != b) ? a + b : {fn}(a, b); }}"
IDIV_SIGNED = """{t} pj_idiv_{n}({t} a, {t} b) {{
  if (b == 0) return 0;
  if (b == -1) return ({t})(0 - ({u})a);
  {t} q = a / b, r = a % b;
  return (r != 0 && ((r ^ b) < 0)) ? q - 1 : q;
}}"""
MOD_SIGNED = """{t} pj_mod_{n}({t} a, {t} b) {{
  if (b == 0 || b == -1) return 0;
  {t} r = a % b;
  return (r != 0 && ((r ^ b) < 0)) ? r + b : r;
}}"""
DIVMOD_UNSIGNED = "{t} pj_{name}_{n}({t} a, {t} b) {{ return b == 0 ? 0 : a {sym} b; }}"
FMOD = """{t} pj_mod_{n}({t} a, {t} b) {{
  {t} r = {fn}(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}"""
BFLOAT16 = """{func}float pj_bfloat16_to_float({u16} b) {{ return {bits_float}; }}
{func}{u16} pj_float_to_bfloat16(float x) {{
  {u32} u = {float_bits};
  if ((u & 0x7fffffffu) > 0x7f800000u) return ({u16})(((u >> 16) & 0x8000u) | 0x7fc0u);
  return ({u16})((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}}
{func}float pj_round_bfloat16(float x) {{ return pj_bfloat16_to_float(pj_float_to_bfloat16(x)); }}"""
# a float16's bits widened to float: the target's conversion ({widen}: statements setting f from h), except a NaN,
# built from its bits as NumPy does (sign and payload kept; NVIDIA's conversion gives its canonical NaN instead)
HALF_TO_FLOAT = """{func}float pj_half_to_float({u16} h) {{
  float f;
  {widen}
  {u32} nan = (({u32})h & 0x8000u) << 16 | 0x7f800000u | (({u32})h & 0x3ffu) << 13;
  return (h & 0x7fffu) > 0x7c00u ? {nan_float} : f;
}}"""
# a 64-bit integer as a double that pj_odd_float rounds as it would round the integer: the integer where a double
# holds it, else with its lowest 11 bits folded into a sticky bit (renderer.rounds_through_odd_float)
STICKY_DOUBLE = """double pj_sticky_double_{n}({t} v) {{
  {u} a = {negative} ? ({u})0 - ({u})v : ({u})v;
  double d = a >> 53 ? (double)((a >> 11) | ({u})((a & 2047{us}) != 0)) * 2048.0 : (double)a;
  return {negative} ? -d : d;
}}"""
# a double as a float rounded to odd: rounding that on to a 16-bit float rounds the double once
ODD_FLOAT = """{func}float pj_odd_float(double d) {{
  float x = (float)d;
  {u32} u = {float_bits};
  if ((double)x != d && d == d) u = (u - (fabs((double)x) > fabs(d) ? 1u : 0u)) | 1u;
  return {odd_float};
}}"""
SATURATE = """{t} pj_sat_{n}_{fn}({f} x) {{
  return x != x ? ({t})0 : x <= {lo} ? {tmin} : x >= {hi} ? {tmax} : ({t})x;
}}"""

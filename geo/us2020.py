"""The 52 state-equivalents of the 2020 Census (50 states, DC, Puerto Rico): FIPS code, USPS code, resident
population and counts of counties, census tracts, block groups and tabulation blocks (public 2020 figures; the
shape of ``topdown synth --shape us2020``).

Sources and how exact each column is:

* persons: 2020 Census resident population (April 1, 2020; P.L. 94-171 release), exact; the 50 states and DC
  sum to 331,449,281, Puerto Rico adds 3,285,874.
* counties: counties and equivalents in 2020 (3,143 in the 50 states and DC; 78 municipios), exact.
* tracts, block_groups, blocks: approximate. The national totals are the Census Bureau's 2020 geographic
  tallies (census.gov, "Geography: Tallies", 2020 national table): 84,414 tracts, 239,780 block groups and
  8,132,968 blocks in the 50 states and DC; Puerto Rico 981, 2,555 and 41,987 (its row is exact). Per state:
  tracts are approximate 2020 counts, scaled to the national total; block groups share that total in
  proportion to tracts; blocks share it in proportion to each state's 2010 block count (2010 tallies by
  state, which sum to 11,078,297), except three states given exactly: Rhode Island (25,649 blocks, 250 tracts,
  792 block groups: data/ri_baf2020), California (519,723) and Texas (668,757). Good to within a few percent
  per state for tracts and block groups, to within about 15 % for blocks (the 2010 -> 2020 change differed
  by state); the per-state 2020 tallies table would make them exact.
"""
from __future__ import annotations

from typing import NamedTuple


class StateCounts(NamedTuple):
    """One state-equivalent's 2020 figures (see the module docstring for their sources)."""

    fips: str
    usps: str
    persons: int
    counties: int
    tracts: int
    block_groups: int
    blocks: int


#: fips, usps, persons, counties, tracts, block groups, blocks (one line per state-equivalent, by FIPS code).
_TABLE = """
01  AL     5024279     67    1439    4086   185114
02  AK      733391     30     177     503    33235
04  AZ     7151502     15    1767    5017   177335
05  AR     3011524     75     724    2056   136642
06  CA    39538223     58    9141   25956   519723
08  CO     5773714     64    1449    4115   147540
09  CT     3605944      8     885    2513    49589
10  DE      989948      3     262     744    17696
11  DC      689545      1     206     585     4775
12  FL    21538187     67    5167   14672   355514
13  GA    10711908    159    2800    7951   213600
15  HI     1455271      5     462    1312    18357
16  ID     1839106     44     457    1298   109954
17  IL    12812508    102    3269    9282   331352
18  IN     6785528     92    1698    4822   195977
19  IA     3190369     99     897    2547   158507
20  KS     2937880    105     830    2357   175085
21  KY     4505836    120    1308    3714   118635
22  LA     4657757     64    1390    3947   150024
23  ME     1362359     16     407    1156    51012
24  MD     6177224     24    1477    4194   106583
25  MA     7029917     14    1622    4606   115580
26  MI    10077331     83    3021    8578   242071
27  MN     5706494     87    1507    4279   190625
28  MS     2961279     82     879    2496   126051
29  MO     6154913    115    1656    4702   252109
30  MT     1084225     56     319     906    97073
31  NE     1961504     93     557    1582   141882
32  NV     3104614     17     779    2212    62034
33  NH     1377529     10     350     994    35837
34  NJ     9288994     21    2184    6202   124444
35  NM     2117522     33     613    1741   123726
36  NY    20201249     62    5418   15385   256955
37  NC    10439388    100    2675    7596   212060
38  ND      779094     53     223     633    98160
39  OH    11799448     88    3172    9007   268091
40  OK     3959353     77    1207    3427   197480
41  OR     4237256     36    1002    2845   144281
42  PA    13002700     67    3450    9796   309331
44  RI     1097379      5     250     792    25649
45  SC     5118425     46    1325    3762   133485
46  SD      886667     66     235     667    64839
47  TN     6910840     95    1703    4836   176198
48  TX    29145505    254    6905   19607   668757
49  UT     3271616     29     717    2036    84685
50  VT      643077     14     193     548    23907
51  VA     8631393    133    2201    6250   209693
53  WA     7705281     39    1786    5071   143513
54  WV     1793716     55     547    1553    99223
55  WI     5893718     72    1544    4384   185723
56  WY      576851     23     162     460    63257
72  PR     3285874     78     981    2555    41987
"""

#: The 52 state-equivalents, by FIPS code.
US2020: tuple[StateCounts, ...] = tuple(
    StateCounts(f, u, *map(int, counts)) for f, u, *counts in (line.split() for line in _TABLE.strip().splitlines()))

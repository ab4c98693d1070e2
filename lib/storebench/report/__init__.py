"""Reporting across studies, above them: the decision guide (``guide``), every figure
(``figures``), the findings and caveats (``findings``), every study's performance targets
(``targets``) and the README's findings block (``readme``). Each study declares what it
contributes; nothing here names a study."""

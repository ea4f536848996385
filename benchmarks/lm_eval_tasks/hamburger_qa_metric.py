"""The metric of the hamburger_qa lm-eval task: the answer appears as a whole word in the reply."""

import re


def process_results(doc, results):
  """doc: {"question", "answer"}; results: [the generated reply] -> {"contains_answer": 0 or 1}."""
  word = r"(?<![A-Za-z0-9_])" + re.escape(doc["answer"]) + r"(?![A-Za-z0-9_])"
  return {"contains_answer": float(re.search(word, results[0], re.IGNORECASE) is not None)}

"""stockade.supervisor"""
